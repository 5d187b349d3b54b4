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
# Right only for n above 33 million: every smaller instance takes the other arm of the `if`, so
# only the call's own instance can prove a call of that size.
BIG_ONLY = """
schedule big_only(x: sym T[n], op: redop) implements allreduce(x, op) {
  part = split(x, world)
  barrier
  on aiv: part[rank] = op(part[rank]@p for p in ranks)
  if n > 33000000: on sdma: for p in peers: part[rank]@p = part[rank]
  barrier
}
"""
# The two-level AllReduce with the node's size given at the call (a divisor parameter): every
# divisor of the world is a different instance, and a call with another value is refused.
TWO_LEVEL = """
schedule two_level(x: sym T[n], g: divisor, op: redop) implements allreduce(x, op) {
  team node = block(g)
  team lane = across(node)
  part = split(x, g)
  chunk = split(part, world / g)
  let me = node.rank
  barrier(node)
  on aiv: part[me] = op(part[me]@p for p in node.ranks)
  barrier(lane)
  on aiv: chunk[me][lane.rank] = op(chunk[me][lane.rank]@p for p in lane.ranks)
  barrier(lane)
  on sdma: for p in lane.peers: chunk[me][lane.rank]@p = chunk[me][lane.rank]
  barrier(lane)
  on sdma: for p in node.peers: part[me]@p = part[me]
  barrier(node)
}
"""
