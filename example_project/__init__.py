"""The example project: a docs site whose pages are rebuilt, debounced, when files change."""
