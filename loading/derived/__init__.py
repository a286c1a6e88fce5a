"""Model files Tandem derives from the user's GGUFs, in one place: `files` (where they live, the
source's SHA-256, building one atomically), `quantized` (a draft requantized to Q4_0),
`early_exit` (the target's first k layers), `vocab_trim` (a draft with a trimmed output
vocabulary) and `embeddings` (loading that draft over the source's embeddings), with `gguf_copy`
writing edited copies of a GGUF."""
