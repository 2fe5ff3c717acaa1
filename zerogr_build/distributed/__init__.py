"""The partitioned build for catalogs past one machine (docs/scaling.md): engine-agnostic driver
(driver.py), task bodies (tasks.py), the driver's file assembly (assemble.py), and the Ray adapter
(ray_engine.py), run in a process of its own (ray_process.py); both are imported only when `--engine ray`
is asked for."""
