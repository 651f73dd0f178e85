"""The built-in HTTP/1.1 server that ``python run.py`` serves the app with.

Why a package: the server is three jobs kept apart. ``rules`` is the wire (sans-I/O, in the
manner of h11: request heads, framing, keep-alive decisions, as strict as h11); ``connection``
is one connection's socket I/O (timed reads and writes, ``wsgi.input``, the hang-up check);
``server`` is the serving policy (threads, limits, keep-alive, graceful shutdown). Any other
WSGI server can host the app instead (``agui_adapter.wsgi``); nothing outside this package
depends on it.
"""
