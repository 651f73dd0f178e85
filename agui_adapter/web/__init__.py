"""The WSGI application: the HTTP surface of the adapter.

Why a package: everything a request meets before and around a run lives here and nowhere
else: routing, auth, CORS, request ids, JSON errors and the SSE response (``app``), the
access log and the body every response goes out through (``access_log``), the thread as a
resource (``thread_resource``), the console page and the client modules (``console_page``,
``client_modules``, their files in ``console/``). It validates with ``protocol`` and hands
admitted runs to ``run``.
"""
