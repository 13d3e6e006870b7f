"""`run` and `chat` with --format json and --json-schema FILE: every answer is
constrained by a grammar, so it parses (and validates) as JSON."""

from __future__ import annotations

import json

import jsonschema
from typer.testing import CliRunner

from llmctl.cli.app import app

runner = CliRunner()
BASE = ["--temperature", "0", "--max-tokens", "120", "--ctx-size", "512"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "legs": {"type": "integer"}},
          "required": ["name", "legs"], "additionalProperties": False}


def test_run_format_json_answers_one_object():
    r = runner.invoke(app, ["run", "smollm2", "Describe a cat.", "--format", "json", *BASE])
    assert r.exit_code == 0, r.output
    assert isinstance(json.loads(r.stdout), dict)


def test_run_json_schema_answers_validate(tmp_path):
    schema = tmp_path / "animal.json"
    schema.write_text(json.dumps(SCHEMA))
    r = runner.invoke(app, ["run", "smollm2", "Describe a spider.", "--json-schema",
                            str(schema), *BASE])
    assert r.exit_code == 0, r.output
    jsonschema.validate(json.loads(r.stdout), SCHEMA)


def test_chat_format_json_constrains_every_answer():
    r = runner.invoke(app, ["chat", "smollm2", "--format", "json", *BASE],
                      input="Describe a dog.\nNow a bird.\n")
    assert r.exit_code == 0, r.output
    answers = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(answers) == 2 and all(isinstance(json.loads(a), dict) for a in answers)


def test_bad_format_and_schema_are_one_line_errors(tmp_path):
    r = runner.invoke(app, ["run", "smollm2", "Hi", "--format", "xml", *BASE])
    assert r.exit_code == 2 and "only json" in r.output
    schema = tmp_path / "bad.json"
    schema.write_text(json.dumps({"type": "string", "pattern": "(?=a)a"}))
    r = runner.invoke(app, ["run", "smollm2", "Hi", "--json-schema", str(schema), *BASE])
    assert r.exit_code == 2 and "lookaround" in r.output and "Traceback" not in r.output
