"""The trace replay's parts, one concept a module, each importing only the modules beneath it;
bench/trace_replay.py is their command line. None imports kvcore, vllm or torch at module level:
the vLLM side (`trace_replay.py --peer vllm`) imports this package in the vLLM venv, which has
numpy but no kvcore."""
