"""The API's request and response models, by route group: the floor between the routes and
the database.

`service.api` (and the CLI, the planner, the regressions report) build these from what
`service.db` returns — ORM rows and plain row tuples — through the models' own classmethods;
`service.db` never imports this package. Modules: `sweeps`, `trials` (a trial, its attempts,
profile and environment), `results` (GET /api/results: filters and CSV), `schedules` (and the
regressions of their sweeps), `planner` (GET /api/capacity), `system` (health, options), and
`utc` (the one datetime type every model's times use).
"""
