"""Task synthesis: seed operators, composers, filters, decontamination and the pipeline."""
