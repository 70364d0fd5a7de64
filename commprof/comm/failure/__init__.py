"""How a job fails and is named: the watchdog thread and its control plane, the flight record (in memory,
in a ring file, dumped for torch's fr_trace) and the faults tests inject."""
