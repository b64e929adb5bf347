from replaywatch.cli import entrypoint

entrypoint()
