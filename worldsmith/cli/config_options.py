"""Command-line options derived from pydantic models (a flow's parameters, a training config), so a
model is the one source of its options' names, types, defaults and help.

Every leaf field of a model is one option (fields of nested models flattened: `lora.rank` is
`--lora-rank`, a field name `--kebab-case`); its help is the field's description, its default the
field's default (for a field of a nested model whose own default is an instance, that instance's
value: CurateParameters.query's checks), its type the field's (a Literal or an Enum is a choice
option, its values listed in --help and checked while parsing; a `list[str]` a repeatable one).
Adding a field to `TrainingConfig` (worldsmith/training/config.py) or `GenerateParameters`
(worldsmith/tasks/parameters.py) thereby adds an option to `train` or `generate` with the default
and help that the deployment's form shows. A field's constraints (`ge`, `le`, validators) stay the
model's: the command builds the model, and a bad value is the model's one line (exit 2, by the
root handler in cli/console.py), as in the deployment's form.

A command built with `config_command` receives only the fields the command line set, as nested
dicts: the model fills in the rest, and its validators see which fields the user set. An optional
nested model (`simulate`) is set exactly when its required field's option (`--simulate`) is given.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias, Union

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

UNSET: Any = inspect.Parameter.empty
"""No default: the option is required (or, inside an optional nested model, it turns the model on)."""

OptionValue: TypeAlias = str | int | float | bool | enum.Enum | list[str] | None
"""What an option's value is: a text, a number, a flag, a choice, a repeated option's texts; None: unset."""
ConfigValues: TypeAlias = dict[str, "OptionValue | ConfigValues"]
"""The config fields a command line set, nested as the config's models nest (`Config.model_validate(values)`)."""


@dataclass(frozen=True)
class ConfigOption:
    """One option: `flag` sets the config fields at `paths` (dotted); `default` is shown in the help.
    A `fixed` default is the command's own and is set even when the option is not given; any other
    default is the config's, and the field is left unset then. `within` names the optional nested
    model the field belongs to, if any, and `switch_of` that model when this option is its required
    field (the model is set exactly when this option is given)."""

    flag: str
    paths: tuple[str, ...]
    kind: Any
    help: str
    default: Any = UNSET
    fixed: bool = False
    switch_of: str | None = None
    within: str | None = None

    @property
    def parameter(self) -> str:
        """The command function's parameter name of this option."""
        return self.flag.removeprefix("--").replace("-", "_")

    def signature_parameter(self) -> inspect.Parameter:
        decls = f"{self.flag}/--no-{self.flag.removeprefix('--')}" if self.kind is bool else self.flag
        return inspect.Parameter(
            self.parameter,
            inspect.Parameter.KEYWORD_ONLY,
            default=self.default,
            annotation=Annotated[self.kind, typer.Option(decls, help=self.help)],
        )


def _without_none(annotation: Any) -> tuple[Any, bool]:
    """`annotation` without `None`, and whether it allowed None."""
    if typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(annotation):
        rest = tuple(a for a in typing.get_args(annotation) if a is not type(None))
        return (rest[0] if len(rest) == 1 else Union[rest]), True  # noqa: UP007 - a union built at run time
    return annotation, False


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The pydantic model `annotation` names (None if it names none), and whether it may be None."""
    inner, optional = _without_none(annotation)
    return (inner if inspect.isclass(inner) and issubclass(inner, BaseModel) else None), optional


def _command_line_type(annotation: Any) -> Any:
    """The type typer parses for a field of type `annotation` (a Literal or an Enum stays one: a choice
    option, its values listed in --help and checked while parsing)."""
    inner, optional = _without_none(annotation)
    if typing.get_origin(inner) is Literal or inspect.isclass(inner) and issubclass(inner, enum.Enum):
        return annotation
    if inner not in (str, int, float, bool) and inner != list[str]:
        raise TypeError(f"a field of type {annotation!r} has no command-line form")
    return inner | None if optional else inner


def _leaf_paths(config: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Dotted paths of every leaf field of `config`, in declaration order."""
    for name, info in config.model_fields.items():
        model, _ = _nested_model(info.annotation)
        if model is None:
            yield prefix + name
        else:
            yield from _leaf_paths(model, f"{prefix}{name}.")


def _resolve(config: type[BaseModel], path: str) -> tuple[FieldInfo, list[tuple[str, FieldInfo, bool]]]:
    """The field at `path` and the nested-model fields above it: (their path, field, may be None)."""
    parents: list[tuple[str, FieldInfo, bool]] = []
    model, *names = config, *path.split(".")
    for depth, name in enumerate(names[:-1]):
        info = model.model_fields[name]
        nested, optional = _nested_model(info.annotation)
        if nested is None:
            raise KeyError(f"{config.__name__}.{path}: {name} is not a nested model")
        parents.append((".".join(names[: depth + 1]), info, optional))
        model = nested
    return model.model_fields[names[-1]], parents


def _default_within_parents(config: type[BaseModel], path: str) -> Any:
    """The value at `path` in the default instance of the outermost nested model above it that has one
    (UNSET when none has: the leaf's own default applies)."""
    model, names = config, path.split(".")
    for depth, name in enumerate(names[:-1]):
        info = model.model_fields[name]
        nested, _ = _nested_model(info.annotation)
        if not info.is_required() and isinstance(value := info.get_default(call_default_factory=True), BaseModel):
            for attribute in names[depth + 1 :]:
                value = getattr(value, attribute)
            return value
        assert nested is not None  # _resolve checked the path
        model = nested
    return UNSET


def option_for(config: type[BaseModel], *paths: str, flag: str | None = None, default: Any = UNSET) -> ConfigOption:
    """The option setting the fields at `paths` of `config` (the first one gives its type, help and
    default); `default`: the command's own default instead of the config's, set even when not given.
    A nested model's default instance that differs from its class's defaults gives its fields' defaults
    the same way (they are set, so that the model the command builds is that instance)."""
    info, parents = _resolve(config, paths[0])
    if default is UNSET and not info.is_required():
        inherited = _default_within_parents(config, paths[0])
        if inherited is not UNSET and inherited != info.get_default(call_default_factory=True):
            default = inherited
    leaf = paths[0].rsplit(".", 1)[-1]
    description = info.description or ""
    if not description and parents:
        parent_help = (parents[-1][1].description or "").rstrip(".")
        description = f"{parent_help}: {leaf}." if parent_help else f"{leaf}."
    kind = _command_line_type(info.annotation)
    within = next((path for path, _, optional in reversed(parents) if optional), None)
    switch_of = within if within is not None and info.is_required() else None
    if switch_of is not None:  # the optional model's required field: giving it turns the model on
        owner = parents[-1][1]
        help_ = f"{owner.description or ''} {description}".strip()
        return ConfigOption(
            flag or f"--{switch_of.replace('_', '-')}",
            paths,
            kind | None,
            help_,
            None,
            switch_of=switch_of,
            within=within,
        )
    if default is not UNSET:
        fixed = True
    else:
        fixed, default = False, UNSET if info.is_required() else info.get_default(call_default_factory=True)
    return ConfigOption(
        flag or "--" + paths[0].replace(".", "-").replace("_", "-"),
        paths,
        kind,
        description,
        default,
        fixed=fixed,
        within=within,
    )


def options_for(
    config: type[BaseModel], *, flags: Mapping[str, str] | None = None, defaults: Mapping[str, Any] | None = None
) -> list[ConfigOption]:
    """One option per leaf field of `config`; `flags` renames options and `defaults` gives the
    command's own defaults, by dotted field path. Options of an optional nested model say in their
    help that they apply with its switch (`With --simulate: ...`)."""
    flags, defaults = flags or {}, defaults or {}
    options = [
        option_for(config, path, flag=flags.get(path), default=defaults.get(path, UNSET))
        for path in _leaf_paths(config)
    ]
    switches = {o.switch_of: o.flag for o in options if o.switch_of is not None}
    return [
        dataclasses.replace(o, help=f"With {switches[o.within]}: {_lowercase_first(o.help)}")
        if o.within in switches and o.switch_of is None
        else o
        for o in options
    ]


def _lowercase_first(text: str) -> str:
    """`text` continuing a sentence: its first letter lowercased unless it starts an acronym."""
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def _set(values: ConfigValues, path: str, value: OptionValue) -> None:
    *parents, leaf = path.split(".")
    for name in parents:
        nested = values.setdefault(name, {})
        assert isinstance(nested, dict), f"{path}: {name} is a field, not a nested model"
        values = nested
    values[leaf] = value


def _given(ctx: typer.Context, parameter: str) -> bool:
    """Whether the command line (or the environment) gave `parameter`, rather than its default."""
    source = ctx.get_parameter_source(parameter)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")  # typer bundles click's enum privately


def config_values(options: Sequence[ConfigOption], given: Mapping[str, OptionValue]) -> ConfigValues:
    """The nested field values of the options in `given` (by parameter name), for `Config.model_validate(values)`;
    an optional nested model is left out unless its switch is among them."""
    values: ConfigValues = {}
    for option in options:
        if option.parameter in given:
            for path in option.paths:
                _set(values, path, given[option.parameter])
    for option in options:
        if option.switch_of is not None and given.get(option.parameter) is None:
            *parents, leaf = option.switch_of.split(".")
            holder = values
            for name in parents:
                nested = holder.get(name, {})
                holder = nested if isinstance(nested, dict) else {}
            holder.pop(leaf, None)
    return values


def config_command(options: Sequence[ConfigOption]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command function one option per ConfigOption ahead of its own parameters. The function
    takes the config values set on the command line as its first parameter (see `config_values`)."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = list(inspect.signature(command, eval_str=True).parameters.values())[1:]
        names = {o.parameter for o in options}
        if clash := names & {p.name for p in own}:
            raise ValueError(f"{command.__name__}: parameters {sorted(clash)} are also config options")

        def run(ctx: typer.Context, **parameters: Any) -> None:
            given = {o.parameter: parameters[o.parameter] for o in options if o.fixed or _given(ctx, o.parameter)}
            command(config_values(options, given), **{k: v for k, v in parameters.items() if k not in names})

        context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        keyword_only = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [context, *(o.signature_parameter() for o in options), *keyword_only]
        )
        run.__name__, run.__qualname__, run.__doc__, run.__module__ = (
            command.__name__,
            command.__qualname__,
            command.__doc__,
            command.__module__,
        )
        return run

    return decorate
