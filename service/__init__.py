"""service: the FastAPI app, database, scheduler, dashboard and the `gdn-sweep` CLI."""
