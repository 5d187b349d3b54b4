"""Schedules that are right only for some of the instances a call can make: the call's own checks
and proof must refuse the others (ranks.py runs them on rank processes, test_verdicts.py proves
their instances directly)."""

# Right only when out has as many elements as x: with m > n it reads past x (into whatever lies
# after it on the heap), with m < n it leaves most of x behind.
GRAB = """
schedule grab(x: sym T[n], out: sym T[m], root: rank) implements broadcast(x -> out, root) {
  barrier
  on sdma: out[0:m] = x[0:m]@root
  barrier
}
"""
# Right only for even n: for odd n the reduced parts never reach the peers.
EVEN_ONLY = """
schedule even_only(x: sym T[n], op: redop) implements allreduce(x, op) {
  part = split(x, world)
  barrier
  on aiv: part[rank] = op(part[rank]@p for p in ranks)
  if n % 2 == 0: on sdma: for p in peers: part[rank]@p = part[rank]
  barrier
}
"""
# Right only for n above 33 million: an instance of that size is more than the verifier simulates,
# and every smaller one takes the other arm of the `if`.
BIG_ONLY = """
schedule big_only(x: sym T[n], op: redop) implements allreduce(x, op) {
  part = split(x, world)
  barrier
  on aiv: part[rank] = op(part[rank]@p for p in ranks)
  if n > 33000000: on sdma: for p in peers: part[rank]@p = part[rank]
  barrier
}
"""
