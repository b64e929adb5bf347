"""The HTTP edge: an app factory and one router per concern."""

from replaywatch.api.app import create_app

__all__ = ["create_app"]
