"""Shared test harnesses: thread ranks (`local`), worker-process pools (`mp`), exact references (`ref`)."""
