"""Plain reference implementations the tests check the fast code against and the benchmarks
measure it against: the replay semantics (:mod:`tests.oracles.replay`, a scan per victim) and
the route views (:mod:`tests.oracles.route`, dicts and loops over rows). They share no code
with :mod:`bmoe`."""
