"""The strategy catalog (what `commprof run` knows of each strategy before any rank starts) agrees with every
strategy class: its name, backends and whether it is model parallel."""


def test_the_catalog_agrees_with_every_strategy_class():
    from commprof.strategies import CATALOG, STRATEGIES

    for name, entry in CATALOG.items():
        cls = STRATEGIES[name]
        assert (cls.name, cls.backends, cls.model_parallel) == (name, entry.backends, entry.model_parallel)
