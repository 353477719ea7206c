"""Service core: settings (`config.Settings`) and the database engine (`db`)."""
