/*
 * args.c - the argument parsing the subcommands share: the configs
 * directory, "[CONFIG.yml] [key=value ...]", and typed options. The error
 * messages are the commands' own (the bad_input tests in tests/cli pin them): each
 * option kind keeps the wording of the command that introduced it.
 */
#include "cli/cli.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/err.h"
#include "config/config.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

int st_cli_is_help(const char *arg)
{
	return !strcmp(arg, "--help") || !strcmp(arg, "-h");
}

const char *st_cli_use_config_dir(void)
{
	char dir[PATH_MAX];
	const char *env = getenv("SLICETRAIN_CONFIG_DIR");
	if (env && *env) {
		st_config_set_config_dir(env);
		return st_config_get_config_dir();
	}
	snprintf(dir, sizeof(dir), "configs");
	char exe[PATH_MAX];
	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (len > 0) {
		exe[len] = 0;
		const char *bindir = dirname(exe);
		char cand[PATH_MAX + 32];
		snprintf(cand, sizeof(cand), "%s/../configs", bindir);
		if (!realpath(cand, dir)) {
			snprintf(cand, sizeof(cand), "%s/configs", bindir);
			if (!realpath(cand, dir))
				snprintf(dir, sizeof(dir), "configs");
		}
	}
	st_config_set_config_dir(dir);
	return st_config_get_config_dir();
}

static int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

static int is_config_file(const char *arg)
{
	return has_suffix(arg, ".yml") || has_suffix(arg, ".yaml") || has_suffix(arg, ".json") ||
	       !strncmp(arg, "/dev/fd/", 8) || !strncmp(arg, "/proc/self/fd/", 14);
}

/* "5GB", "200MB", "1000": bytes (powers of 1000, as transformers' max_shard_size). */
static int parse_size(const char *s, int64_t *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	double mul = 1;
	if (end == s || errno || v <= 0)
		return -1;
	if (!strcasecmp(end, "KB") || !strcasecmp(end, "K"))
		mul = 1e3;
	else if (!strcasecmp(end, "MB") || !strcasecmp(end, "M"))
		mul = 1e6;
	else if (!strcasecmp(end, "GB") || !strcasecmp(end, "G"))
		mul = 1e9;
	else if (*end && strcasecmp(end, "B"))
		return -1;
	if (v * mul < 1 || v * mul > 9e18)
		return -1;
	*out = (int64_t)(v * mul);
	return 0;
}

/* v: the option's value, NULL when the command line ends after the option. */
static int parse_value(const st_cli_opt *o, const char *v)
{
	const char *shown = v ? v : "";
	char *end;
	switch (o->kind) {
	case ST_CLI_FLAG:
		*(int *)o->value = 1;
		return 0;
	case ST_CLI_COUNT: {
		errno = 0;
		long long x = v ? strtoll(v, &end, 10) : 0;
		if (!v || !*v || *end || x < 1)
			return st_fail(ST_EINVAL, "%s needs a whole number >= 1, got '%s'", o->name, shown);
		/* counts of slices and devices: a bound keeps every product of
		 * them (devices, tokens, bytes) far from int64 overflow */
		if (errno || x > ST_CLI_COUNT_MAX)
			return st_fail(ST_EINVAL, "%s is at most %d, got '%s'", o->name, ST_CLI_COUNT_MAX, shown);
		*(int64_t *)o->value = x;
		return 0;
	}
	case ST_CLI_INT: {
		errno = 0;
		long x = v ? strtol(v, &end, 10) : 0;
		if (!v || errno || end == v || *end || x < o->min || x > o->max)
			return st_fail(ST_EINVAL, "%s needs a positive integer (%d..%d)", o->name, o->min, o->max);
		*(int *)o->value = (int)x;
		return 0;
	}
	case ST_CLI_GIB: {
		double x = v ? strtod(v, &end) : 0;
		if (!v || !*v || *end || !(x > 0))
			return st_fail(ST_EINVAL, "%s needs a size in GiB > 0, got '%s'", o->name, shown);
		*(double *)o->value = x * GIB;
		return 0;
	}
	case ST_CLI_SIZE:
		if (!v)
			return st_fail(ST_EINVAL, "%s needs a value", o->name);
		if (parse_size(v, (int64_t *)o->value) < 0)
			return st_fail(ST_EINVAL, "%s '%s' is not a size (e.g. 5GB)", o->name, v);
		return 0;
	case ST_CLI_REAL: {
		double x = v ? strtod(v, &end) : 0;
		if (!v || !*v || *end || !isfinite(x))
			return st_fail(ST_EINVAL, "%s needs a number, got '%s'", o->name, shown);
		*(double *)o->value = x;
		return 0;
	}
	case ST_CLI_STRING:
		if (!v)
			return st_fail(ST_EINVAL, "%s needs a value", o->name);
		*(const char **)o->value = v;
		return 0;
	}
	ST_BUG("option %s: unknown kind %d", o->name, (int)o->kind);
}

int st_cli_option(const st_cli_opt *opts, int argc, char **argv, int *i)
{
	const char *arg = argv[*i];
	for (const st_cli_opt *o = opts; o && o->name; o++) {
		size_t n = strlen(o->name);
		if (o->alias && !strcmp(arg, o->alias))
			n = strlen(arg);
		else if (strncmp(arg, o->name, n) || (arg[n] && !(arg[n] == '=' && o->joined)))
			continue;
		const char *v = NULL;
		if (arg[n])
			v = arg + n + 1;
		else if (o->kind != ST_CLI_FLAG && *i + 1 < argc)
			v = argv[++*i];
		int rc = parse_value(o, v);
		return rc < 0 ? rc : 1;
	}
	return 0;
}

/* The distance of arg ("--name" or "--name=VALUE", compared by its name) to name. */
static int option_distance(const char *arg, const char *name)
{
	char a[257];
	size_t n = strcspn(arg, "=");
	if (n >= sizeof(a))
		return 1000;
	memcpy(a, arg, n);
	a[n] = 0;
	return st_edit_distance(a, name);
}

const char *st_cli_suggest_option(const st_cli_opt *opts, const char *const *extra, const char *arg)
{
	const char *best = NULL;
	int best_d = 1 << 30, d;
	for (const st_cli_opt *o = opts; o && o->name; o++)
		if ((d = option_distance(arg, o->name)) < best_d)
			best_d = d, best = o->name;
	for (const char *const *e = extra; e && *e; e++)
		if ((d = option_distance(arg, *e)) < best_d)
			best_d = d, best = *e;
	/* as near as the config loader's suggestions for keys (config.c) */
	return best && best_d <= 2 + (int)strcspn(arg, "=") / 3 ? best : NULL;
}

int st_cli_unknown_option(const char *cmd, const st_cli_opt *opts, const char *const *extra, const char *arg)
{
	const char *hint = st_cli_suggest_option(opts, extra, arg);
	if (hint)
		return st_fail(ST_EINVAL, "unknown option '%s'; did you mean '%s'? (see slicetrain %s --help)", arg, hint,
			       cmd);
	return st_fail(ST_EINVAL, "unknown option '%s' (see slicetrain %s --help)", arg, cmd);
}

/* An argument of the config part that is neither CONFIG.yml nor key=value;
 * "--key=value" and "--option" get a hint of what was probably meant. */
static int neither(const char *arg, const char *cmd)
{
	if (arg[0] == '-' && arg[1] == '-' && arg[2] && strchr(arg, '='))
		return st_fail(ST_EINVAL, "'%s' is neither a CONFIG.yml nor a key=value override; did you mean "
			       "'%s'? (config keys take no dashes: see slicetrain %s --help)", arg, arg + 2, cmd);
	if (arg[0] == '-')
		return st_fail(ST_EINVAL, "'%s' is neither a CONFIG.yml nor a key=value override (the config part "
			       "takes no options: see slicetrain %s --help)", arg, cmd);
	return st_fail(ST_EINVAL, "'%s' is neither a CONFIG.yml nor a key=value override", arg);
}

int st_cli_config_args_parse(st_cli_config_args *a, int argc, char **argv, const st_cli_opt *opts,
			     const char *cmd, int flags)
{
	int rc = 0;
	*a = (st_cli_config_args)ST_CLI_CONFIG_ARGS_INIT;
	if (!(a->kv = calloc((size_t)argc + 1, sizeof(char *))))
		return st_fail(ST_ENOMEM, "out of memory");
	for (int i = 0; i < argc && rc == 0; i++) {
		char *arg = argv[i];
		if (flags & ST_CLI_LEADING) {
			if (i == 0 && is_config_file(arg))
				a->config = arg;
			else if (i == 0 && !strchr(arg, '='))
				rc = neither(arg, cmd);
			else if (arg[0] == '-')
				rc = neither(arg, cmd);
			else
				a->kv[a->nkv++] = arg;
		} else if ((rc = st_cli_option(opts, argc, argv, &i)) != 0) {
			rc = rc < 0 ? rc : 0;
		} else if (arg[0] == '-' && arg[1] == '-') {
			rc = st_cli_unknown_option(cmd, opts, NULL, arg);
		} else if (!a->config && !strchr(arg, '=') && is_config_file(arg)) {
			a->config = arg;
		} else if (strchr(arg, '=')) {
			a->kv[a->nkv++] = arg;
		} else {
			rc = neither(arg, cmd);
		}
	}
	if (rc == 0 && (flags & ST_CLI_LEADING)) { /* also tells the loader where configs/ is */
		const char *dir = st_cli_use_config_dir();
		if (a->config)
			snprintf(a->path, sizeof(a->path), "%s", a->config);
		else
			snprintf(a->path, sizeof(a->path), "%s/default.yml", dir);
	}
	if (rc == 0 && !a->config && (flags & ST_CLI_NEED_CONFIG))
		rc = st_fail(ST_EINVAL, "%s needs a CONFIG.yml (see slicetrain %s --help)", cmd, cmd);
	return rc;
}

void st_cli_config_args_release(st_cli_config_args *a)
{
	free(a->kv);
	*a = (st_cli_config_args)ST_CLI_CONFIG_ARGS_INIT;
}
