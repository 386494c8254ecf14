"""Talking to the API server: the client, credentials, and the list-then-watch loop."""
