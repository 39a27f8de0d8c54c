"""Results: the versioned run schema, the run store and SQLite index, comparisons and reports.

The API a benchmark uses (see docs/RESULTS.md):

    from pi2cli.results import schema, store
    run = schema.new_run(engine=schema.engine_info(...), model=schema.model_info(...),
                         workload=schema.workload_info(...), target=schema.target_info(...), ...)
    schema.add_turn(run, n_prompt=..., n_gen=..., ttft_ns=..., samples_ns=[...])
    path = store.save_run(run, results_dir)
"""
