"""WSGI entry point: ``gunicorn wsgi:app -c gunicorn.conf.py``. No I/O at import."""

from serving import create_app

app = create_app()
