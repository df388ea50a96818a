"""The built-in methods, one file each (options, term, metrics); the registry
(``hindsearch.hindsight.registry.METHODS``) imports one when its name is first looked up."""
