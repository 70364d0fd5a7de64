"""`commprof run`: profile one training strategy — compute/communication split and transfer volume."""
