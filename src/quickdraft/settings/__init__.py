"""Configuration in one room: every option by name (`options.py`: its flag, YAML key, bench key and
parser), the engine's and a request's options (`engine_config.py`), the CLI's flags made from them
(`flags.py`), and what runs when a choice is left at auto (`defaults.py`: `resolve`, once per engine). The
value types decoding reads (`config.py`: sampling, stop, draft) and the spec strings' option parsers
(`spec_options.py`) sit on the ground floor, below everything that reads them."""
