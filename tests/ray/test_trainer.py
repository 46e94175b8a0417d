"""Unit tests of deploy/ray/slicetrain_elastic_trainer.py's pure parts (no
Ray cluster): the group plan (whole slices, ordering, rounding down), the
slicetrain environment, the run token's file, the step line, the driver's
refusals of bad input (exit 2 before Ray is touched). Run by tests/ray/trainer.sh."""
import importlib.util
import os
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "deploy", "ray", "slicetrain_elastic_trainer.py")
spec = importlib.util.spec_from_file_location("trainer", SCRIPT)
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)


def members(*slices, host_index=None):
    return [{"slice": s, "host_index": None if host_index is None else host_index[i], "addr": f"10.0.0.{i}",
             "port": 5000 + i} for i, s in enumerate(slices)]


class PlanGroup(unittest.TestCase):
    def test_one_host_slices(self):
        p = T.plan_group(members("", ""), 1, 1, [1, 2], 2)
        self.assertEqual(p["num_slices"], 2)
        self.assertEqual(p["slices"], [[0], [1]])
        self.assertEqual(p["role"], {0: (0, 0), 1: (1, 0)})
        self.assertEqual(p["world"], 2)
        self.assertEqual(p["coordinator"], "10.0.0.0:5000")
        self.assertIsNone(p["warning"])

    def test_more_workers_than_max_are_idle(self):
        p = T.plan_group(members("", "", ""), 1, 4, [1, 2], 2)
        self.assertEqual((p["num_slices"], p["world"], p["idle"]), (2, 8, [2]))

    def test_named_slices_rounded_down(self):
        # 3 Ray workers, 2 hosts per slice: slice a whole, b has 1 of its 2 hosts
        p = T.plan_group(members("a", "a", "b"), 2, 2, [1, 2], 2)
        self.assertEqual(p["slices"], [[0, 1]])
        self.assertEqual(p["idle"], [2])
        self.assertEqual(p["role"], {0: (0, 0), 1: (0, 1)})
        self.assertEqual(p["world"], 4)

    def test_rank0_in_an_incomplete_slice(self):
        p = T.plan_group(members("b", "a", "a"), 2, 1, [1, 2], 2)
        self.assertEqual(p["slices"], [[1, 2]])
        self.assertEqual(p["idle"], [0])
        self.assertEqual(p["coordinator"], "10.0.0.1:5001")

    def test_slice_of_rank0_first_then_by_rank(self):
        p = T.plan_group(members("b", "a", "a", "b"), 2, 1, [1, 2], 2)
        self.assertEqual(p["slices"], [[0, 3], [1, 2]])

    def test_host_index_orders_hosts(self):
        p = T.plan_group(members("a", "a", host_index=[1, 0]), 2, 1, [1], 1)
        self.assertEqual(p["slices"], [[1, 0]])
        self.assertEqual(p["role"], {1: (0, 0), 0: (0, 1)})
        self.assertEqual(p["coordinator"], "10.0.0.1:5001")

    def test_duplicate_host_index_falls_back_to_rank(self):
        p = T.plan_group(members("a", "a", host_index=[0, 0]), 2, 1, [1], 1)
        self.assertEqual(p["slices"], [[0, 1]])

    def test_unnamed_multi_host_slices_warn(self):
        p = T.plan_group(members("", "", "", "", ""), 2, 1, [1, 2], 2)
        self.assertEqual(p["slices"], [[0, 1], [2, 3]])
        self.assertEqual(p["idle"], [4])
        self.assertIn("SLICETRAIN_SLICE_NAME", p["warning"])

    def test_too_many_workers_on_a_slice(self):
        with self.assertRaisesRegex(ValueError, "more than its 2 hosts"):
            T.plan_group(members("a", "a", "a"), 2, 1, [1], 1)

    def test_largest_usable_count(self):
        p = T.plan_group(members("", ""), 1, 1, [1, 3], 3)  # 2 whole slices; the mesh fits 1 or 3
        self.assertEqual(p["num_slices"], 1)
        self.assertEqual(p["idle"], [1])

    def test_none_usable(self):
        p = T.plan_group(members("a"), 2, 1, [1, 2], 2)
        self.assertEqual((p["num_slices"], p["coordinator"], p["world"]), (0, None, 0))

    def test_ipv6_coordinator(self):
        m = members("")
        m[0]["addr"] = "fd00::1"
        self.assertEqual(T.plan_group(m, 1, 1, [1], 1)["coordinator"], "[fd00::1]:5000")


class Environment(unittest.TestCase):
    def test_slicetrain_env(self):
        base = {"PATH": "/bin", "RAY_AUTH_TOKEN": "secret", "RAY_AUTH_TOKEN_PATH": "/t", "RAY_AUTH_MODE": "token",
                "SLICETRAIN_RAY_HOSTS_PER_SLICE": "1", "RANK": "5", "WORLD_SIZE": "9", "MASTER_ADDR": "x",
                "SLICETRAIN_TOKEN_FILE": "/run/token", "MEGASCALE_NUM_SLICES": "3"}
        e = T.slicetrain_env(base, rank=3, world=4, local_rank=1, coordinator="10.0.0.1:5000", num_slices=2,
                             slice_id=1, max_devices=8, generation=2, threads=4)
        for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "SLICETRAIN_RAY_HOSTS_PER_SLICE", "RANK",
                  "WORLD_SIZE", "MASTER_ADDR"):
            self.assertNotIn(k, e)
        self.assertEqual(e["SLICETRAIN_TOKEN_FILE"], "/run/token")
        self.assertEqual(e["MEGASCALE_NUM_SLICES"], "3")  # overridden by SLICETRAIN_NUM_SLICES in env.c
        want = {"SLICETRAIN_RANK": "3", "SLICETRAIN_WORLD_SIZE": "4", "SLICETRAIN_LOCAL_RANK": "1",
                "SLICETRAIN_COORDINATOR": "10.0.0.1:5000", "SLICETRAIN_NUM_SLICES": "2", "SLICETRAIN_SLICE_ID": "1",
                "SLICETRAIN_ELASTIC_MAX_DEVICES": "8", "SLICETRAIN_GENERATION": "2", "OMP_NUM_THREADS": "4"}
        self.assertEqual({k: e[k] for k in want}, want)

    def test_token_file(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, "is not set"):
                T.check_token_file({})
            with self.assertRaisesRegex(ValueError, "No such file"):
                T.check_token_file({"SLICETRAIN_TOKEN_FILE": os.path.join(d, "none")})
            with self.assertRaisesRegex(ValueError, "not a regular file"):
                T.check_token_file({"SLICETRAIN_TOKEN_FILE": d})
            f = os.path.join(d, "token")
            with open(f, "w") as fh:
                fh.write("a-token-of-more-than-16-bytes\n")
            os.chmod(f, 0o644)
            with self.assertRaisesRegex(ValueError, "mode 0644"):
                T.check_token_file({"SLICETRAIN_TOKEN_FILE": f})
            os.chmod(f, 0o600)
            self.assertEqual(T.check_token_file({"SLICETRAIN_TOKEN_FILE": f}), f)
            link = os.path.join(d, "link")  # a mounted Secret's file is a symbolic link
            os.symlink(f, link)
            self.assertEqual(T.check_token_file({"SLICETRAIN_TOKEN_FILE": link}), link)
            os.chmod(f, 0o400)
            self.assertEqual(stat.S_IMODE(os.stat(link).st_mode), 0o400)
            self.assertEqual(T.check_token_file({"SLICETRAIN_TOKEN_FILE": link}), link)

    def test_step_line(self):
        r = T.parse_step_line("completed step: 99, seconds: 0.693, TFLOP/s/device: 83.171, Tokens/s/device: "
                              "11819.175, total_weights: 262144, loss: 0.334")
        self.assertEqual(r, {"step": 99, "perf/step_time_seconds": 0.693, "perf/per_device_tflops_per_sec": 83.171,
                             "perf/per_device_tokens_per_sec": 11819.175, "learning/total_weights": 262144,
                             "learning/loss": 0.334})
        self.assertIsNone(T.parse_step_line("slicetrain: checkpoint step 5: ..."))
        self.assertIsNone(T.parse_step_line("[rank 1] completed step: 1, seconds: 1"))


class Driver(unittest.TestCase):
    """The driver's refusals: exit 2 and a line saying why, before Ray."""

    def run_driver(self, *args, env=None):
        e = dict(os.environ, **(env or {}))
        e.pop("RAY_ADDRESS", None)
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=e, timeout=120,
                              cwd=ROOT)

    def test_bad_input(self):
        base = os.path.join(ROOT, "configs", "base.yml")
        cases = [
            ((base, "model_name=llama3-test"), "set base_output_directory"),
            ((base, "base_output_directory=rel/dir"), "is relative"),
            ((base, "base_output_directory=/tmp/x", "enable_checkpointing=false"), "enable_checkpointing is false"),
            ((base, "--min-slices", "1"), "not key=value"),
            (("nope.yml", "base_output_directory=/tmp/x"), "no config file"),
            (("--min-slices", "3", "--max-slices", "2", base), "larger than --max-slices"),
            (("--resources-per-worker", "[1]", base), "not a JSON object"),
            ((base, "base_output_directory=/tmp/x", "model_name=llama3-test", "ici_fsdp_parallelism=4"),
             "the mesh must resolve"),
            ((base, "base_output_directory=/tmp/x", "model_name=llama3-test", "dcn_data_parallelism=2"),
             "dcn_data_parallelism=2 does not fit 1 slice (elastic runs give their DCN axes as -1)"),
        ]
        for args, want in cases:
            with self.subTest(args=args):
                r = self.run_driver("--hosts-per-slice", "1", "--devices-per-host", "1", *args,
                                    env={"SLICETRAIN_BIN": os.environ["SLICETRAIN"]})
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(want, r.stderr)

    def test_options_from_the_environment(self):
        a = T.parse_args(["x.yml"])
        self.assertEqual((a.hosts_per_slice, a.devices_per_host, a.min_slices, a.max_slices), (4, 4, 1, 2))
        os.environ["SLICETRAIN_RAY_HOSTS_PER_SLICE"] = "1"
        try:
            self.assertEqual(T.parse_args(["x.yml"]).hosts_per_slice, 1)
            self.assertEqual(T.parse_args(["--hosts-per-slice", "2", "x.yml"]).hosts_per_slice, 2)
        finally:
            del os.environ["SLICETRAIN_RAY_HOSTS_PER_SLICE"]


if __name__ == "__main__":
    unittest.main(verbosity=2)
