"""A docs site: rebuild a folder's pages once its files stop changing (a debounced task)."""
