"""The OpenAI-compatible HTTP API (`tandem serve`, `tandem ui --api`).

`parsing.py` (with the field readers of `fields.py`) turns a JSON body into the engine's
settings, `responses.py` formats the engine's stats and events as OpenAI objects, the queue
(app/runtime/queue.py, shared with the page) serialises generations on the pair, `stream.py` drives the engine from the event loop,
`routes.py` holds the FastAPI routes and `server.py` runs them, alone or mounted on the Gradio
app.
"""
