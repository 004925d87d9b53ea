"""Import and export of other projects' trajectory formats (Online-Mind2Web)."""
