"""Plumbing every service shares and none owns: settings loading, Kafka helpers.

No business logic lives here; rules about requests are in `mdproto.rules`.
"""
