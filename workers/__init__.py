"""workers: Ray placement and execution of sweep trials (see ARCHITECTURE.md). Not built yet."""
