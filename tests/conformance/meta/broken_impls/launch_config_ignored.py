"""Broken: `launch` never reads a config file (neither `--config_file` nor the default location).

Rule: the launcher honours the config file. Caught at world 1 by ``launch.config_file``,
``launch.config_location`` and ``config.write_basic_config``, at world 2 by ``launch.cli``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
ref.replace("commands.launch.load_config_from_file", lambda config_file: None, everywhere=False)
ref.export(globals())
