"""Which files of a model source a bake needs (bake.hub downloads only these; bake.sources
and bake.pipeline use the tokenizer and chat-template list)."""

from __future__ import annotations

# Tokenizer and chat-template files, whatever the model's format.
PROCESSING_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
)
# Files a conversion needs from a hub checkpoint; everything else (other formats,
# READMEs, images, original/ folders) is never downloaded.
HF_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    *PROCESSING_FILES,
]
ONNX_PATTERNS = [*HF_PATTERNS, "*.onnx", "*.onnx.data", "*.onnx_data", "genai_config.json"]
# An ONNX export's small files; its graph is added by name, one variant only.
ONNX_SMALL_FILES = ["config.json", "generation_config.json", *PROCESSING_FILES]
