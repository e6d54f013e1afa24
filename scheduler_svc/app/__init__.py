"""Assembly: the `llmsched` command, the configuration file read and checked, TLS, logging, the event loop,
and the server that wires the faces, the cluster and the scheduler together. It may import everything."""
