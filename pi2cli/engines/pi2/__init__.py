"""The pi2 engine (pi2-engine): driver.py, chat.py (its chat sessions), args.py (every argv),
events.py (the events file), serve.py (`pi2 serve`), measure.py (the predictor check)."""
