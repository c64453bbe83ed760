"""`larder ls PATH...` on the gpt-oss reference checkpoints (tests/ref/gpt_oss_reference.py, fixture
gpt_oss_ref): the QUANT column names the format a user knows the checkpoint by, and RUNS says
whether larder loads it, read the way loading reads it (the architecture's own config reader).

  * OpenAI's layout (quantization_config.quant_method "mxfp4", experts as *_blocks / *_scales U8
    tensors) is "MXFP4 experts", not the dtype holding most bytes (U8 in the real checkpoints, F32
    in this tiny one);
  * a quant_method larder does not execute is shown by its name (GPTQ), and RUNS says why not;
  * the MLX 4-bit one stays "MLX 4-bit g32 mixed".
"""
import json
import os
import re
import shutil
import tempfile
import unittest

from cli_models import run

MODELS = os.path.join(os.environ.get("LARDER_TEST_DATA_DIR", ""), "models")
OPENAI = os.path.join(MODELS, "gpt_oss_openai_mxfp4")
MLX4 = os.path.join(MODELS, "gpt_oss_mlx4")
# MODEL  ARCH  QUANT  SIZE  RUNS, columns two spaces apart (SIZE is "633.8 KiB").
ROW = re.compile(r"^(\S+)\s+(\S+)\s{2,}(\S.*?)\s{2,}(\d+(?:\.\d+)? \S+)\s{2}(.*)$")


@unittest.skipUnless(os.path.isdir(OPENAI), f"{OPENAI} absent (fixture gpt_oss_ref)")
class LsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="larder_cli_ls_")
        cls.env = dict(os.environ, HF_HUB_CACHE=os.path.join(cls.tmp, "empty-hub"))
        # OpenAI's checkpoint with a quantization method larder does not execute.
        cls.gptq = os.path.join(cls.tmp, "gptq")
        os.makedirs(cls.gptq)
        with open(os.path.join(OPENAI, "config.json")) as f:
            config = json.load(f)
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
        with open(os.path.join(cls.gptq, "config.json"), "w") as f:
            json.dump(config, f)
        for name in os.listdir(OPENAI):
            if name != "config.json":
                os.symlink(os.path.join(OPENAI, name), os.path.join(cls.gptq, name))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ls(self, *paths):
        code, out, err = run("ls", *paths, env=self.env)
        self.assertEqual(code, 0, err)
        rows = {}
        for line in out.splitlines()[1:]:
            m = ROW.match(line)
            self.assertTrue(m, f"unparsed ls line: {line!r}\n{out}")
            rows[m.group(1)] = {"arch": m.group(2), "quant": m.group(3), "runs": m.group(5)}
        return rows

    def test_openai_mxfp4_is_mxfp4_and_runs(self):
        row = self.ls(OPENAI)[OPENAI]
        self.assertEqual(row["arch"], "gpt_oss")
        self.assertEqual(row["quant"], "MXFP4 experts")
        self.assertEqual(row["runs"], "yes")  # the gpt-oss config reader, as loading uses (not the generic one)

    def test_unsupported_quant_method_is_named(self):
        row = self.ls(self.gptq)[self.gptq]
        self.assertEqual(row["quant"], "GPTQ")
        self.assertTrue(row["runs"].startswith("no: "), row)
        self.assertIn("gptq", row["runs"])

    @unittest.skipUnless(os.path.isdir(MLX4), f"{MLX4} absent")
    def test_mlx_quantized_neighbour_unchanged(self):
        row = self.ls(MLX4)[MLX4]
        self.assertEqual(row["quant"], "MLX 4-bit g32 mixed")
        self.assertEqual(row["runs"], "yes")


if __name__ == "__main__":
    unittest.main()
