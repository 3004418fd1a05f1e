"""The user's data files, read without torch: rows of text, prompt/completion and chat data
(`records`), preference pairs and feedback (`preference_records`), and the loss plot drawn from a
run's event log (`plot`). The checker reads them before a run and the runtime while it runs, by
the same rules."""
