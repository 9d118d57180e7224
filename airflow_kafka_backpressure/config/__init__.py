"""Configuration: the pipelines file (PipelineConfig), the settings Variable (ControllerSettings), where a sink may be, and the generated reference."""
