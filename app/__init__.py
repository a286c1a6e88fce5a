"""What users touch: the command line (`tandem`) and the Gradio app, both thin over the engine."""
