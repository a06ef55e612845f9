"""Header names shared by the server's routes and the PD final turn (a leaf module: it imports
nothing, so `pd/final.py` need not import the routes to name a header)."""

#: the header by which sglang-router's manual policy picks a worker (one per key)
ROUTING_KEY_HEADER = "x-smg-routing-key"
