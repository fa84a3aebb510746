"""The bake step: turn a model source into a verified ONNX GenAI folder for one target."""
