"""llm-scheduler's public API: the generated code of protos/llmsched (one subpackage per API version) and the
hand-written facts every face and client shares (`llmsched.v1.errors`). The service, the Python client and
the tests import it; it imports nothing of theirs."""
