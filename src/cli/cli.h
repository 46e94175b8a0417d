/*
 * cli.h - the subcommands of the slicetrain binary, and the argument
 * parsing they share. Only src/cli holds command-line code: the library
 * (libslicetrain.a) takes parsed values and returns error codes.
 *
 * Each st_cmd_X takes the arguments after its command name ("train",
 * "plan", ...) and returns the process exit status (main exits with it):
 * 0 done, 2 bad input (config, data, arguments: one "slicetrain: error:"
 * line says what), 1 other failures, 3 a peer of the worker group failed,
 * 128+N stopped by signal N. "--help" or "-h" prints the command's usage on
 * stdout and returns 0.
 */
#ifndef ST_CLI_CLI_H
#define ST_CLI_CLI_H

#include <limits.h>
#include <stdint.h>

/* slicetrain train [CONFIG.yml] [key=value ...]: train.c */
int st_cmd_train(int argc, char **argv);

/*
 * slicetrain plan CONFIG.yml [key=value ...] [--num-slices S]
 * [--devices-per-slice D] [--memory GiB] [--json]: plan.c. 0 when the run
 * fits, 1 when it does not (the report, with a variant that fits when one
 * is found, printed all the same), 2 bad input.
 */
int st_cmd_plan(int argc, char **argv);

/*
 * slicetrain launch --num-slices S --devices-per-slice D [--threads-per-device T]
 *                   [--port P] -- [CONFIG.yml] [key=value ...]: launch.c
 *
 * Starts S x D worker processes (`slicetrain train CONFIG ...`), each with
 * the SLICETRAIN_* variables giving its place (docs/distributed.md), streams
 * rank 0's output as is and other ranks' lines prefixed "[rank N] ", and
 * exits with the first failing rank's status after stopping the others
 * (SIGTERM, then SIGKILL after a grace period); a rank killed by a signal
 * is a peer failure, status 3. Workers die with the launcher
 * (PR_SET_PDEATHSIG): no orphans.
 */
int st_cmd_launch(int argc, char **argv);
/* slicetrain controller --listen ADDRESS:PORT [launch's elastic options] --
 * [CONFIG.yml] [key=value ...]: the elastic controller alone, for agents on
 * other hosts (docs/hosts.md): launch.c. */
int st_cmd_controller(int argc, char **argv);

/*
 * slicetrain agent --controller HOST:PORT --slice S --host H --hosts-per-slice N
 *                  --devices D [--threads-per-device T] [--grace S] [--quiet]: agent.c
 *
 * The elastic agent of one host (elastic/agent.h): 0 after the controller's
 * shutdown or a SIGTERM whose workers stopped, 3 the controller is
 * unreachable or gone, 1 it broke the protocol, 130 SIGINT.
 */
int st_cmd_agent(int argc, char **argv);

/*
 * slicetrain nodes --controller HOST:PORT [--json]: nodes.c. The live picture
 * of an elastic run (slices, hosts, workers, state, since when, last
 * heartbeat, the group's mesh and step), from its controller's status.
 */
int st_cmd_nodes(int argc, char **argv);

/* slicetrain export CHECKPOINT_DIR OUT_DIR [--shard-size SIZE]: ckpt.c */
int st_cmd_export(int argc, char **argv);
/* slicetrain ckpt list|verify DIR: ckpt.c; 1 when a checkpoint is damaged. */
int st_cmd_ckpt(int argc, char **argv);

/*
 * slicetrain tokenize [CONFIG.yml] [key=value ...] -o OUT.bin [--text-field NAME]
 *                     [--format auto|text|jsonl] [--bos T] [--eos T] [--threads N] INPUT...:
 * tokenize.c. Text and JSON lines -> one llm.c .bin token file with the
 * tokenizer_path tokenizer.json (docs/data.md); 2 for bad input (tokenizer,
 * UTF-8, a JSON line without the field), no output file unless it succeeds.
 */
int st_cmd_tokenize(int argc, char **argv);

/*
 * slicetrain generate MODEL_DIR [CONFIG.yml] [key=value ...] [--prompt TEXT]
 *                     [--prompt-ids IDS] [--max-tokens N] [--temperature T]
 *                     [--top-p P] [--seed S] [--ignore-eos] [--ids] [--json]:
 * generate.c. Text from a checkpoint or a Hugging Face directory with a KV
 * cache (docs/generate.md), streamed to stdout, tokens/s on stderr; 2 for
 * bad input (model, tokenizer, prompt, options).
 */
int st_cmd_generate(int argc, char **argv);

/* ---- shared argument parsing: args.c ---- */

/* "--help" or "-h". */
int st_cli_is_help(const char *arg);

/*
 * Find the configs directory and hand it to the config loader
 * (st_config_set_config_dir): $SLICETRAIN_CONFIG_DIR, else configs/ next to
 * the binary (build/slicetrain -> ../configs, then ./configs beside it),
 * else "configs". Returns the directory (the loader's copy).
 */
const char *st_cli_use_config_dir(void);

/*
 * A command's options: a table ending with {0}. Each option takes the next
 * argument as its value (whatever it is), or, with .joined, also
 * "--name=VALUE". The kind gives the value's type, where it is stored and
 * the message of a missing or bad value (the commands' messages, kept as
 * they were):
 *   ST_CLI_FLAG   int, set to 1; takes no value
 *   ST_CLI_COUNT  int64_t, a whole number from 1 to ST_CLI_COUNT_MAX
 *                 "--x needs a whole number >= 1, got 'V'"
 *   ST_CLI_INT    int, a whole number in [min, max]
 *                 "--x needs a positive integer (min..max)"
 *   ST_CLI_GIB    double, a size in GiB > 0, stored in bytes
 *                 "--x needs a size in GiB > 0, got 'V'"
 *   ST_CLI_SIZE   int64_t, bytes: "5GB", "200MB", "1000" (powers of 1000,
 *                 as transformers' max_shard_size)
 *                 "--x needs a value", "--x 'V' is not a size (e.g. 5GB)"
 *   ST_CLI_REAL   double, any finite number (the caller checks its range)
 *                 "--x needs a number, got 'V'"
 *   ST_CLI_STRING const char *, the value as given (may be empty)
 *                 "--x needs a value"
 * .alias: another spelling of the option ("-p"), never joined.
 */
#define ST_CLI_COUNT_MAX (1 << 20)
/* The most slices, hosts per slice, devices per slice (or per agent) and
 * threads per device a command accepts. */
enum { ST_CLI_MAX_SLICES = 4096, ST_CLI_MAX_HOSTS = 4096, ST_CLI_MAX_DEVICES = 4096, ST_CLI_MAX_THREADS = 4096 };
enum st_cli_kind { ST_CLI_FLAG = 1, ST_CLI_COUNT, ST_CLI_INT, ST_CLI_GIB, ST_CLI_SIZE, ST_CLI_REAL, ST_CLI_STRING };

typedef struct st_cli_opt {
	const char *name; /* "--num-slices" */
	enum st_cli_kind kind;
	void *value;      /* int, int64_t, double or const char *, as the kind says */
	int min, max;     /* ST_CLI_INT's range */
	int joined;       /* "--name=VALUE" accepted too */
	const char *alias;
} st_cli_opt;

/*
 * If argv[*i] is an option of opts, parse it (and its value, advancing *i
 * past it) and return 1; return 0 if it is not one of them; ST_EINVAL with
 * the kind's message for a missing or bad value.
 */
int st_cli_option(const st_cli_opt *opts, int argc, char **argv, int *i);

/*
 * An argument that looks like an option ("--num-slice", "--seed=3") but is
 * none of the command's: the nearest option name among opts and extra (a
 * NULL-terminated list of the options the command parses by itself; either
 * may be NULL), "--name=VALUE" compared by its name, when it is near enough
 * (at most 2 + length/3 edits, as the config loader's suggestions for keys);
 * else NULL.
 */
const char *st_cli_suggest_option(const st_cli_opt *opts, const char *const *extra, const char *arg);
/* ST_EINVAL: "unknown option 'ARG'; did you mean 'NAME'? (see slicetrain CMD
 * --help)", without the suggestion when there is none. */
int st_cli_unknown_option(const char *cmd, const st_cli_opt *opts, const char *const *extra, const char *arg);

/* "[CONFIG.yml] [key=value ...]" split out of a command line. */
typedef struct st_cli_config_args {
	const char *config; /* the CONFIG.yml argument, NULL if none */
	char **kv;          /* the key=value overrides, in order (pointers into argv) */
	int nkv;
	/* ST_CLI_LEADING: the file to load, CONFIG.yml or else the embedded
	 * default (<configs>/default.yml) */
	char path[PATH_MAX + 16];
} st_cli_config_args;
#define ST_CLI_CONFIG_ARGS_INIT {NULL, NULL, 0, ""}

/*
 * Flags of st_cli_config_args_parse:
 *   ST_CLI_LEADING   the config part leads and the rest is overrides (train,
 *                    and what launch hands its workers after "--"): only
 *                    argv[0] is classified, as CONFIG.yml when it ends in
 *                    .yml or .yaml, else it must hold a '='; the arguments
 *                    after it are all overrides, which the config loader
 *                    checks. No options.
 *   otherwise        options of opts anywhere; the first argument ending in
 *                    .yml or .yaml without a '=' is CONFIG.yml; other
 *                    arguments with a '=' are overrides; any other "--x" is
 *                    "unknown option '--x' (see slicetrain CMD --help)", with
 *                    "; did you mean '--y'?" before the parenthesis when
 *                    an option is near (st_cli_unknown_option).
 *   ST_CLI_NEED_CONFIG  no CONFIG.yml is "CMD needs a CONFIG.yml (see
 *                    slicetrain CMD --help)".
 * Any other argument is "'X' is neither a CONFIG.yml nor a key=value
 * override" (for "--key=value", with "did you mean 'key=value'?"; an
 * argument starting with '-' is never an override). Returns 0 or ST_EINVAL / ST_ENOMEM with a message; a->kv is
 * allocated: st_cli_config_args_release (also after an error).
 */
enum { ST_CLI_LEADING = 1, ST_CLI_NEED_CONFIG = 2 };
int st_cli_config_args_parse(st_cli_config_args *a, int argc, char **argv, const st_cli_opt *opts,
			     const char *cmd, int flags);
void st_cli_config_args_release(st_cli_config_args *a);

/* ---- before a run starts: preflight.c ---- */

struct st_config;
/*
 * The data the config reads exists (st_dataset_check_paths), before
 * anything of the run is written. When what is missing is the default job's
 * (data/default/), the message ends with the command that makes it (`make
 * data`). ST_EINVAL.
 */
int st_cli_check_data(const struct st_config *c);

/* The run a launcher starts (st_cli_launch_prepare). */
typedef struct st_cli_run {
	char **argv; /* the workers' config part: the given one, plus run_name=NAME unless given */
	int argc;
	char run_name[256];
	char run_name_kv[256 + 16];
} st_cli_run;
/*
 * slicetrain launch, before it starts anything: its config part (what
 * follows "--") loaded once, quietly (the workers print it), its model
 * checked, its data checked (st_cli_check_data), a derived run_name claimed
 * (st_config_claim_run_dir), and the workers' arguments with the run's one
 * name pinned. ST_EINVAL (one line) for bad input; run->argv points into
 * argv: st_cli_run_release.
 */
int st_cli_launch_prepare(int argc, char **argv, st_cli_run *run);
void st_cli_run_release(st_cli_run *run);

#endif
