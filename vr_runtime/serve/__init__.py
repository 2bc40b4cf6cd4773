"""``videorouter serve``: an OpenAI-compatible video QA server (docs/CONTRACT.md section 6).

Modules: ``command`` (arguments, start-up), ``app`` (the FastAPI app), ``schema`` (requests,
responses), ``media`` (video URLs, the media directory, uploads), ``engine`` (one model per
process, a request's way through the bounded queue, deadlines), ``admission`` (the queue's counts,
slots and batchable requests), ``prefetch`` (each video checked and decoded off the model's lock),
``errors`` (OpenAI-style error objects), ``ray_app`` (the same app as a Ray Serve deployment). FastAPI and uvicorn come with the ``serve`` extra,
Ray with the ``ray`` extra; nothing here is imported by ``import vr_runtime``.
"""
