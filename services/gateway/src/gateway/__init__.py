"""WebSocket and HTTP gateway: the platform for browsers and non-Python clients.

It translates JSON over WebSocket and HTTP to the platform's protocol through the
SDK (`mdclient`), fans each upstream topic out to every WebSocket subscriber, and
serves a chart page (docs/protocol.md, "Gateway").
"""
