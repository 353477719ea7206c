"""Alembic's migrations (env.py, versions/) and what the revision scripts share (views.py).

A package so a revision script can `from migrations.views import …`: alembic.ini puts the
folder that holds it on sys.path (`prepend_sys_path = %(here)s`) whenever Alembic reads the
scripts, from whatever the working directory.
"""
