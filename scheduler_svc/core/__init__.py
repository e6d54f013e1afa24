"""The service's own vocabulary, below dispatch: the request a door hands in and the admission rules that
validate it, the caller's identity, queues, the ticket and its run, errors, the clock. It may import the
configuration (`scheduler_svc.config`) and the backend port (`backends.base`, `backends.errors`) only."""
