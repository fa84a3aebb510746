"""ortserve core: the engine, the model manifest and the HTTP semantics shared by every target."""
