"""``hindsearch train`` (the main job) and ``hindsearch sft`` (the protocol warm-up alone).

``hindsearch train`` with no arguments runs the ``tiny-cpu`` preset. ``--config`` takes a TOML file
or the name of a shipped preset (``tiny-cpu``, ``qwen2.5-3b-instruct``, ...), looked up in the
``configs/`` folder of the checkout (``pip install -e .``) or of the current directory.
"""

from __future__ import annotations

import argparse

# the preset lookup lives with Config
from hindsearch.config import DEFAULT_PRESET, find_config
from hindsearch.hindsight.registry import METHODS


class PluginAction(argparse.Action):
    """``--plugin SPEC``: imported as soon as it is parsed (its methods become valid ``--method``
    values), and appended to the run's ``plugins``. A plugin that fails raises out of the parsing
    (``PluginError``, naming the plugin), which ``hindsearch.cli.main`` reports in one line."""

    def __call__(self, parser, namespace, values, option_string=None):
        from hindsearch.config.registry import load_plugin

        load_plugin(values)
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), values])


def register(sub: argparse._SubParsersAction) -> None:
    from hindsearch.cli.args import positive_int

    p = sub.add_parser("train",
                       help="warm-up + GRPO/HindSearch/IGSD training with dev EM before and after")
    p.add_argument("--config", default=None,
                   help=f"TOML file or preset name (default: {DEFAULT_PRESET})")
    p.add_argument("--plugin", action=PluginAction, default=[], metavar="MODULE_OR_FILE",
                   help="import a module or .py file that registers methods, retriever kinds or "
                        "reward functions (added to the config's plugins; repeatable; give it "
                        "before --method)")
    method = p.add_argument("--method", default=None,
                            help="override the config's method (default: the config's)")
    # the registered methods, read when the help is shown or --method is checked
    method.choices = METHODS
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set train.steps=4 (repeatable)")
    p.add_argument("--out", default=None, help="run folder (default: the config's `out`)")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch CPU threads (train.threads; default: 1 on 2 cores or fewer or a "
                        "busy machine, else torch's; the run says which and why)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue a run from its last complete checkpoint (default: start a new "
                        "run)")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: use a RUN_DIR/config.toml edited since the run started in "
                        "a key that changes training (refused otherwise); the change is recorded "
                        "in the run")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_train)
    q = sub.add_parser("sft", help="protocol warm-up: SFT on demonstration rollouts (loss on "
                                   "generated tokens)")
    q.add_argument("--config", default=None,
                   help="TOML file or preset name (default: built-in defaults)")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field")
    q.add_argument("--demos", default=None,
                   help="trajectories JSONL to imitate (default: scripted searcher)")
    q.add_argument("--out", required=True,
                   help="output folder: model, tokenizer, warmup.json, demos.jsonl")
    q.add_argument("--debug", action="store_true", help="show tracebacks")
    q.set_defaults(func=_cmd_sft)


def _cmd_sft(args: argparse.Namespace) -> int:
    from hindsearch.fsutil import claim_output, guard_output
    from hindsearch.train.warmup import cmd_sft

    if args.config:  # a TOML file or a shipped preset name, from any folder (as for train)
        args.config = str(find_config(args.config))
    # the model is saved into --out in place: only a new or empty folder, or an earlier warm-up
    # folder
    out = guard_output(args.out, "sft", "warm-up folder")
    created = not out.exists()
    args.out = str(out)
    claim_output(out, "sft")
    try:
        return cmd_sft(args)
    except BaseException:
        if created:  # a failed first run leaves nothing behind
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        raise


def _cmd_train(args: argparse.Namespace) -> int:
    from hindsearch.config import Config
    from hindsearch.train.run import run_train

    if args.resume:
        if args.config or args.method or args.set or args.out is not None or args.plugin:
            raise ValueError("--resume uses the run's saved config.toml; drop "
                             "--config/--method/--set/--out/--plugin")
        run_train(resume=args.resume, allow_config_change=args.allow_config_change,
                  threads=args.threads)
        return 0
    if args.allow_config_change:
        raise ValueError("--allow-config-change goes with --resume RUN_DIR")
    overrides = list(args.set) + ([f"train.threads={args.threads}"] if args.threads else [])
    if args.method:
        overrides.append(f'method="{args.method}"')
    cfg = Config.load(find_config(args.config), overrides, out=args.out)
    if args.plugin:
        cfg.use_plugins(
            [*cfg.plugins, *(p for p in args.plugin if p not in cfg.plugins)], "--plugin")
    run_train(cfg)
    return 0
