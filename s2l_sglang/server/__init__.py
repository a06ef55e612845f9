"""HTTP routes for streams on SGLang's own FastAPI server (installed by the plugin)."""
