/*
 * ckpt.c - slicetrain export, slicetrain ckpt list|verify: the command line
 * of the checkpoint library (src/ckpt/ckpt.h).
 */
#include "cli/cli.h"

#include "base/err.h"
#include "base/file.h"
#include "base/path.h"
#include "ckpt/ckpt.h"
#include "config/config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char export_usage[] =
	"usage: slicetrain export CHECKPOINT_DIR|RUN_DIR OUT_DIR [--shard-size SIZE]\n"
	"\n"
	"Writes the parameters of a checkpoint as a Hugging Face model directory that\n"
	"transformers loads with LlamaForCausalLM.from_pretrained(OUT_DIR): config.json and\n"
	"model.safetensors (float32), or, above SIZE (default 5GB, as save_pretrained),\n"
	"model-0000k-of-0000n.safetensors shards plus model.safetensors.index.json.\n"
	"CHECKPOINT_DIR is a checkpoint step directory (.../checkpoints/<step>), or a run's\n"
	"checkpoints or run directory (its newest committed step), as generate and ckpt\n"
	"list take them. SIZE: bytes, or with a suffix KB, MB, GB (powers of 1000).\n"
	"\n"
	"example (the default job's newest checkpoint):\n"
	"  slicetrain export slicetrain_output/default hf_model/\n";

static const char ckpt_usage[] =
	"usage: slicetrain ckpt list DIR      steps under DIR (a run's checkpoints directory, or\n"
	"                                     the run directory): committed or not, size, mesh, time\n"
	"       slicetrain ckpt verify DIR    recompute every checksum of the checkpoint DIR (a step\n"
	"                                     directory), or of every committed step under DIR;\n"
	"                                     exit 1 naming the file and tensor on a mismatch\n";

static int error_exit(int rc)
{
	fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
	return st_exit_status(rc);
}

/* A bad command line: one error line, then the command's usage; exit 2. */
__attribute__((format(printf, 2, 3))) static int usage_error(const char *usage, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "slicetrain: error: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n\n%s", usage);
	va_end(ap);
	return 2;
}

/* The tokenizer the checkpoint was trained with (its config's
 * tokenizer_path), copied beside the exported model as tokenizer.json, as
 * Hugging Face directories hold it; none known: nothing, and said so. */
static int export_tokenizer(const char *ckpt, const char *out_dir)
{
	st_config *c = calloc(1, sizeof(*c));
	char step[ST_PATH_MAX], path[ST_PATH_MAX + 32];
	int hf = 0, rc;
	if (!c)
		return st_fail(ST_ENOMEM, "out of memory");
	if ((rc = st_ckpt_model_config(ckpt, c, step, sizeof(step), &hf)) < 0) {
		free(c);
		return rc;
	}
	char *data = NULL;
	size_t len = 0;
	if (!c->tokenizer_path[0] || !st_file_exists(c->tokenizer_path)) {
		if (c->tokenizer_path[0])
			fprintf(stderr, "slicetrain: warning: the run's tokenizer %s is gone: no tokenizer.json exported\n",
				c->tokenizer_path);
		free(c);
		return 0;
	}
	snprintf(path, sizeof(path), "%s/tokenizer.json", out_dir);
	if ((rc = st_read_file(c->tokenizer_path, (size_t)1 << 30, &data, &len)) == 0 &&
	    (rc = st_write_file_atomic(path, data, len)) == 0)
		fprintf(stderr, "slicetrain: %s (the run's tokenizer, %s)\n", path, c->tokenizer_path);
	free(data);
	free(c);
	return rc;
}

int st_cmd_export(int argc, char **argv)
{
	const char *pos[2];
	int npos = 0;
	int64_t shard = 0;
	int rc;
	const st_cli_opt opts[] = {
		{.name = "--shard-size", .kind = ST_CLI_SIZE, .value = &shard, .joined = 1},
		{0},
	};

	for (int i = 0; i < argc; i++) {
		if (st_cli_is_help(argv[i])) {
			fputs(export_usage, stdout);
			return 0;
		}
		if ((rc = st_cli_option(opts, argc, argv, &i)) < 0)
			return usage_error(export_usage, "%s", st_errmsg());
		if (rc > 0)
			continue;
		if (argv[i][0] == '-' && argv[i][1]) {
			st_cli_unknown_option("export", opts, NULL, argv[i]);
			return usage_error(export_usage, "%s", st_errmsg());
		}
		if (npos == 2)
			return usage_error(export_usage, "unexpected argument '%s'", argv[i]);
		pos[npos++] = argv[i];
	}
	if (npos != 2)
		return usage_error(export_usage, "export needs CHECKPOINT_DIR and OUT_DIR");
	if ((rc = st_ckpt_export_hf(pos[0], pos[1], shard)) < 0 || (rc = export_tokenizer(pos[0], pos[1])) < 0)
		return error_exit(rc);
	return 0;
}

static const char *human_bytes(int64_t b, char *buf, size_t cap)
{
	if (b >= 1000000000)
		snprintf(buf, cap, "%.2f GB", (double)b / 1e9);
	else if (b >= 1000000)
		snprintf(buf, cap, "%.1f MB", (double)b / 1e6);
	else
		snprintf(buf, cap, "%.1f kB", (double)b / 1e3);
	return buf;
}

static int cmd_list(const char *arg)
{
	char dir[ST_PATH_MAX], size[32], when[64];
	st_ckpt_step_info *v;
	struct stat st;
	int n, rc;

	st_ckpt_resolve_dir(arg, dir, sizeof(dir));
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return st_fail(ST_EINVAL, "%s: no such directory", dir);
	if ((rc = st_ckpt_list(dir, &v, &n)) < 0)
		return rc;
	printf("%s: %d step%s\n", dir, n, n == 1 ? "" : "s");
	if (n)
		printf("%-10s %-12s %10s  %-9s  %-20s  %s\n", "step", "state", "size", "processes", "saved (UTC)", "mesh");
	for (int i = 0; i < n; i++) {
		char procs[32];
		time_t t = (time_t)v[i].time_unix;
		struct tm tm;
		gmtime_r(&t, &tm);
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
		if (v[i].committed == 1)
			snprintf(procs, sizeof(procs), "%d", v[i].process_count);
		else
			snprintf(procs, sizeof(procs), "%d/%d done", v[i].ndone, v[i].process_count);
		printf("%-10" PRId64 " %-12s %10s  %-9s  %-20s  %s\n", v[i].step,
		       v[i].committed == 1 ? "committed" : v[i].committed < 0 ? "damaged" : "uncommitted",
		       human_bytes(v[i].bytes, size, sizeof(size)), procs, when, v[i].mesh);
	}
	free(v);
	return 0;
}

static int verify_one(const char *step_dir, int *bad)
{
	int64_t pieces, bytes;
	char size[32];
	int rc = st_ckpt_verify(step_dir, &pieces, &bytes);
	if (rc == ST_EIO) {
		printf("%s: DAMAGED: %s\n", step_dir, st_errmsg());
		*bad = 1;
		return 0;
	}
	if (rc < 0)
		return rc;
	printf("%s: ok (%" PRId64 " pieces, %s, checksums match)\n", step_dir, pieces, human_bytes(bytes, size, sizeof(size)));
	return 0;
}

static int cmd_verify(const char *arg, int *bad)
{
	char **dirs;
	int n, rc = st_ckpt_verify_targets(arg, &dirs, &n);
	for (int i = 0; i < n && rc == 0; i++)
		rc = verify_one(dirs[i], bad);
	if (n > 0)
		st_ckpt_free_dirs(dirs, n);
	return rc;
}

int st_cmd_ckpt(int argc, char **argv)
{
	int rc, bad = 0;

	if (argc >= 1 && st_cli_is_help(argv[0])) {
		fputs(ckpt_usage, stdout);
		return 0;
	}
	if (argc < 1)
		return usage_error(ckpt_usage, "ckpt needs a subcommand: list or verify");
	if (strcmp(argv[0], "list") && strcmp(argv[0], "verify"))
		return usage_error(ckpt_usage, "unknown ckpt subcommand '%s' (list or verify)", argv[0]);
	if (argc != 2)
		return usage_error(ckpt_usage, "ckpt %s needs exactly one DIR", argv[0]);
	rc = !strcmp(argv[0], "list") ? cmd_list(argv[1]) : cmd_verify(argv[1], &bad);
	if (rc < 0)
		return error_exit(rc);
	if (bad) {
		fprintf(stderr, "slicetrain: error: checkpoint verification failed (see above)\n");
		return 1;
	}
	return 0;
}
