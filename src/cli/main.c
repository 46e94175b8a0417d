/*
 * slicetrain - elastic multi-slice training of Llama 3 models.
 *
 * main() picks the subcommand (src/cli/cli.h) and exits with its status:
 * the only place that exits. Library errors come back as codes and messages
 * and the subcommands map them to exit statuses (2 for bad input, 1 for
 * other failures, 128+N when stopped by signal N).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "config/config.h" /* st_edit_distance */
#include "base/err.h"
#include "base/version.h"


static const char usage[] =
	"usage: slicetrain <command> [args]\n"
	"\n"
	"commands:\n"
	"  train [CONFIG.yml] [key=value ...]   train a model (MaxText-style config and overrides);\n"
	"                                       without CONFIG.yml, the embedded default job\n"
	"                                       (configs/default.yml: llama3-16m on English text, data/default/\n"
	"                                       from `make data`; about 30 s on 2 cores)\n"
	"  launch --num-slices S --devices-per-slice D [--threads-per-device T] -- [CONFIG.yml] [key=value ...]\n"
	"                                       start a worker group on this machine (docs/distributed.md)\n"
	"  agent --controller HOST:PORT --slice S --host H --hosts-per-slice N --devices D\n"
	"                                       the elastic agent of one host (docs/elastic.md)\n"
	"  launch --num-slices S --min-slices M --devices-per-slice D [--max-failures N] -- ...\n"
	"                                       an elastic run: controller and agents (docs/elastic.md)\n"
	"  controller --listen ADDRESS:PORT --num-slices S --devices-per-slice D ... -- ...\n"
	"                                       the elastic controller alone, for agents on many hosts\n"
	"                                       (docs/hosts.md)\n"
	"  nodes --controller HOST:PORT --token-file PATH\n"
	"                                       the live picture of an elastic run (slices, hosts, workers)\n"
	"  export CHECKPOINT_DIR|RUN_DIR OUT_DIR\n"
	"                                       write a checkpoint as a Hugging Face model directory\n"
	"  ckpt list|verify DIR                 list checkpoints, or recompute their checksums\n"
	"  plan CONFIG.yml [key=value ...] [--num-slices S --devices-per-slice D] [--memory GiB]\n"
	"                                       per-device memory and FLOPs of a run, and whether it fits\n"
	"  tokenize tokenizer_path=T -o OUT.bin INPUT...\n"
	"                                       text / JSON lines -> a token file (docs/data.md)\n"
	"  generate MODEL_DIR [key=value ...] --prompt TEXT\n"
	"                                       text from a checkpoint or Hugging Face model (docs/generate.md)\n"
	"  help [command]                       this text, or a command's help\n"
	"  version                              print the version and the build (a digest of this binary)\n"
	"\n"
	"environment:\n"
	"  OMP_NUM_THREADS        threads per device (default: all cores)\n"
	"  SLICETRAIN_CONFIG_DIR  where configs/ lives (default: next to the binary, then ./configs)\n"
	"\n"
	"exit status: 0 success, 1 failure, 2 bad input (config, data, arguments),\n"
	"             3 a peer of the worker group failed, 128+N stopped by signal N\n"
	"             (plan: 1 the run does not fit)\n";

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
} commands[] = {
	{"train", st_cmd_train},
	{"launch", st_cmd_launch},
	{"nodes", st_cmd_nodes},
	{"agent", st_cmd_agent},
	{"controller", st_cmd_controller},
	{"export", st_cmd_export},
	{"ckpt", st_cmd_ckpt},
	{"plan", st_cmd_plan},
	{"tokenize", st_cmd_tokenize},
	{"generate", st_cmd_generate},
};

int main(int argc, char **argv)
{
	if (argc < 2) {
		fputs(usage, stderr);
		return 2;
	}
	const char *cmd = argv[1];
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(cmd, commands[i].name))
			return commands[i].run(argc - 2, argv + 2);
	if (st_cli_is_help(cmd) || !strcmp(cmd, "help")) {
		for (size_t i = 0; argc > 2 && i < sizeof(commands) / sizeof(commands[0]); i++)
			if (!strcmp(argv[2], commands[i].name))
				return commands[i].run(1, (char *[]){"--help", NULL});
		fputs(usage, stdout);
		return 0;
	}
	if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		char id[ST_BUILD_ID_LEN + 1];
		if (st_build_id(NULL, id) < 0) {
			fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
			return 1;
		}
		printf("slicetrain %s (build %s)\n", ST_VERSION, id);
		return 0;
	}
	/* one line, with the nearest command when one is near (as options' and keys') */
	const char *best = NULL;
	int best_d = 1 << 30;
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		int d = st_edit_distance(cmd, commands[i].name);
		if (d < best_d)
			best_d = d, best = commands[i].name;
	}
	if (best && best_d <= 1 + (int)strlen(cmd) / 3)
		fprintf(stderr, "slicetrain: error: unknown command '%s'; did you mean '%s'? (see slicetrain --help)\n",
			cmd, best);
	else
		fprintf(stderr, "slicetrain: error: unknown command '%s' (see slicetrain --help)\n", cmd);
	return 2;
}
