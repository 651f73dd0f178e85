"""Helpers shared by the test suites (no tests here).

One module per job, imported by the test modules and by ``tests/conftest.py``:

* ``agui_client``  the AG-UI client over real HTTP (``Client``, ``RunResult``) and the bodies it
  sends (``run_body``, ``resume``), ``session_value``;
* ``agui_stream``  reading and judging AG-UI streams (``parse_sse``, ``check_stream``) and the
  recorder of every stream for the official client (``RECORDER``, ``AGUI_STREAM_DIR``);
* ``flow``         what flow tests against the scripted kernel share (``KERNEL_TOKEN``,
  ``kernel_calls``, ``interrupted``);
* ``kernel_rpc``   a JSON-RPC/SSE client of the scripted kernel (``rpc``, ``message``, ``SSE``,
  ``frames``, ``journal``...), for the tests that pin its dialect;
* ``secrets``      every secret a test sent and every place the adapter could have written it down,
  checked once at the end of the session;
* ``servers``      the adapter under test: in this process (``InProcessAdapter``) or as
  ``python run.py`` (``AdapterProcess``), and ``wait_until_unreachable``;
* ``ports``        ``free_port`` (standard library only);
* ``images``       real, minimal PNG images (``png_bytes``, ``tiny_png``);
* ``fake_llm``     a scripted OpenAI-compatible server for the real-kernel suite;
* ``agui_check/``  the official ``@ag-ui/client`` run over recorded streams (Node).
"""
