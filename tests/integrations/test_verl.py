"""verl (clients/worldsmith-verl), at the interface level: verl 0.9 needs torch and ray, which CI cannot
install on CPU within its budget (docs/integrations.md), so its tool interface's own schemas
(verl/tools/schemas.py, pydantic only, loaded from verl's package without its __init__) check what the
served world gives: each tool's config validates as verl's `OpenAIFunctionToolSchema`, and calls in
verl's call format (`OpenAIFunctionParsedSchema` -> `OpenAIFunctionCallSchema`) made through the world's
session answer what the runtime does, the verdict's reward too."""

from __future__ import annotations

import json

import pytest
from support.integrations import played_directly, plays, through_client
from support.paths import GOLDEN

from worldsmith.bundle.loader import load_bundle

pytestmark = pytest.mark.e2e

#: argv[1] the base URL, argv[2] the plays.
CLIENT = """
import asyncio, importlib.util, json, sys
from pathlib import Path
from worldsmith_verl import WorldSession, tool_config

verl_dir = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
spec = importlib.util.spec_from_file_location("verl_tool_schemas", verl_dir / "tools" / "schemas.py")
schemas = importlib.util.module_from_spec(spec)
spec.loader.exec_module(schemas)

async def main():
    base_url, plays = sys.argv[1], json.loads(sys.argv[2])
    config = await tool_config(base_url, "my_trainer.WorldTool")
    names = [schemas.OpenAIFunctionToolSchema.model_validate(t["tool_schema"]).function.name for t in config["tools"]]
    played = []
    for play in plays:
        async with WorldSession(base_url) as session:
            await session.reset(play["task"])
            values = []
            for name, arguments in play["calls"]:
                parsed = schemas.OpenAIFunctionParsedSchema(name=name, arguments=json.dumps(arguments))
                call, decode_error = schemas.OpenAIFunctionCallSchema.from_openai_function_parsed_schema(parsed)
                assert not decode_error
                text, ok = await session.call(call.name, call.arguments)
                response = schemas.ToolResponse(text=text)
                values.append(json.loads(response.text) if ok else None)
            played.append({"values": values, "reward": await session.submit(play["answer"])})
    print(json.dumps({"tools": names, "played": played}))

asyncio.run(main())
"""


def test_verl_s_tool_schemas_and_call_format_reach_the_served_world_as_the_runtime(home):
    bundle = load_bundle(GOLDEN)
    episodes = plays(bundle)
    out = through_client("worldsmith-verl", CLIENT, bundle, json.dumps([p.as_json() for p in episodes]))
    assert out["tools"] == [t.name for t in bundle.tools]
    for play, through_verl in zip(episodes, out["played"], strict=True):
        direct = played_directly(bundle, play)
        assert through_verl == {"values": direct["values"], "reward": direct["reward"]}, play.task
