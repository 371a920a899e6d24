"""
The actions plugin's declarations and calls, checked by jsonschema, which
is imported at the first declaration rather than when the daemon starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.actions.model import RULE, ActionError, BadCall, actions, readCall

TOP = Path(__file__).resolve().parent.parent

DOOR = {
    "name": "open_door",
    "description": "Open a door.",
    "parameters": {
        "type": "object",
        "properties": {"door": {"type": "string"}},
        "required": ["door"],
    },
}


class ActionsModelTests(SynchronousTestCase):
    def test_docsShowTheRuleRPEngineReceives(self) -> None:
        """
        docs/scenes.md (I{How calls come out}) shows the response-processing
        rule as the plugin sends it, not an older one.
        """
        text = (TOP / "docs" / "scenes.md").read_text(encoding="utf-8")
        section = text[text.index("**How calls come out.**") :]
        start = section.index("```json\n") + 8
        block = section[start : section.index("\n```", start)]
        self.assertEqual(json.loads(block), RULE)

    def test_schemaChecked(self) -> None:
        """
        A declaration whose parameters are not a valid JSON Schema is refused.
        """
        bad = dict(DOOR, parameters={"type": "object", "properties": {"door": {"type": 3}}})
        e = self.assertRaises(ActionError, actions, [bad])
        self.assertIn("actions.actions[0].parameters is not a valid JSON Schema", str(e))

    def test_callChecked(self) -> None:
        """
        A call's arguments are checked against its action's schema.
        """
        offered = actions([DOOR])
        self.assertEqual(
            readCall('open_door{"door": "north"}', offered).arguments, {"door": "north"}
        )
        e = self.assertRaises(BadCall, readCall, 'open_door{"door": 3}', offered)
        self.assertIn("door: 3 is not of type 'string'", str(e))

    def test_jsonschemaImportedAtFirstDeclaration(self) -> None:
        code = (
            "import sys\n"
            "import rpmiddleware.builtin\n"
            "from rpmiddleware.builtin.actions.model import actions\n"
            "print('jsonschema' in sys.modules)\n"
            "actions([{'name': 'wave'}])\n"
            "print('jsonschema' in sys.modules)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=TOP, capture_output=True, text=True, timeout=60
        )
        self.assertEqual(result.stdout.split(), ["False", "True"], result.stderr[-2000:])
