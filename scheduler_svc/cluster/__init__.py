"""Several scheduler replicas acting as one: each model's leader, elected on its own lease in a
shared store, decides for every replica's requests of that model; each replica serves, streams and cancels
the calls it received.

Layer: above the core (it drives dispatchers through their public hooks), below the server that wires it.
The core never imports this package.
"""
