/*
 * preflight.c - what `slicetrain train` and `slicetrain launch` check before
 * anything of a run is started or written: the data the config reads exists
 * (with the command that makes the default job's when that is what is
 * missing), and a derived run_name is claimed (a new run never picks up an
 * unrelated run's checkpoints); a launcher pins the one name for all its
 * workers.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "config/config.h"
#include "data/data.h"
#include "model/llama.h"

/* The default job's data: data/default/ (configs/default.yml), made by
 * `make data` (scripts/default-data.sh: Debian's fortunes, a tokenizer
 * trained on them, the token files; docs/data.md). */
#define DEFAULT_DATA_DIR "data/default/"

static int is_default_data(const char *pattern)
{
	return !strncmp(pattern, DEFAULT_DATA_DIR, strlen(DEFAULT_DATA_DIR)) ||
	       !strncmp(pattern, "./" DEFAULT_DATA_DIR, strlen("./" DEFAULT_DATA_DIR)) ||
	       strstr(pattern, "/" DEFAULT_DATA_DIR);
}

int st_cli_check_data(const st_config *c)
{
	const char *key;
	int rc = st_dataset_check_paths(c, &key);
	if (rc == 0 || !key)
		return rc;
	const char *pattern = !strcmp(key, "dataset_path") ? c->dataset_path : c->grain_eval_files;
	if (rc != ST_EINVAL || !is_default_data(pattern))
		return rc;
	char msg[1024];
	snprintf(msg, sizeof(msg), "%s", st_errmsg());
	/* make data runs where the Makefile is: the repository, whose data/ the
	 * default job's relative paths name when it is started there */
	if (pattern[0] != '/' && access("Makefile", R_OK) == 0 && access("scripts/default-data.sh", R_OK) == 0)
		return st_fail(ST_EINVAL, "%s: the default job's data is not made yet: run `make data` here first "
			       "(scripts/default-data.sh: Debian's fortunes, a tokenizer and the token files; docs/data.md)",
			       msg);
	return st_fail(ST_EINVAL, "%s: the default job's data is not made yet: run `make data` in the slicetrain "
		       "repository, and start the job from there (it reads %s relative to the working directory; "
		       "docs/data.md)", msg, DEFAULT_DATA_DIR);
}

/* One of the overrides sets run_name. */
static int sets_run_name(char **kv, int nkv)
{
	for (int i = 0; i < nkv; i++)
		if (!strncmp(kv[i], "run_name=", 9))
			return 1;
	return 0;
}

int st_cli_launch_prepare(int argc, char **argv, st_cli_run *run)
{
	st_cli_config_args a;
	st_config *c = calloc(1, sizeof(*c));
	int64_t nparams;
	memset(run, 0, sizeof(*run));
	int rc = c ? st_cli_config_args_parse(&a, argc, argv, NULL, "launch", ST_CLI_LEADING)
		   : st_fail(ST_ENOMEM, "out of memory");
	if (rc == 0) {
		st_log_quiet(1); /* the workers print the config's warnings and summary */
		if ((rc = st_config_load(c, a.path, a.nkv, a.kv)) == 0)
			rc = st_llama_check_config(c, &nparams);
		st_log_quiet(0);
	}
	if (rc == 0 && (rc = st_cli_check_data(c)) == 0)
		rc = st_config_claim_run_dir(c);
	/* the workers' config part: as given, plus the run's name when no
	 * override gives it (a derived name is this launcher's, not each worker's) */
	if (rc == 0 && !(run->argv = calloc((size_t)argc + 2, sizeof(char *))))
		rc = st_fail(ST_ENOMEM, "out of memory");
	if (rc == 0) {
		for (int i = 0; i < argc; i++)
			run->argv[run->argc++] = argv[i];
		snprintf(run->run_name_kv, sizeof(run->run_name_kv), "run_name=%s", c->run_name);
		if (!sets_run_name(a.kv, a.nkv))
			run->argv[run->argc++] = run->run_name_kv;
		snprintf(run->run_name, sizeof(run->run_name), "%s", c->run_name);
	}
	if (c)
		st_cli_config_args_release(&a);
	free(c);
	if (rc < 0)
		st_cli_run_release(run);
	return rc;
}

void st_cli_run_release(st_cli_run *run)
{
	free(run->argv);
	run->argv = NULL;
	run->argc = 0;
}
