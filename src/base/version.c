#include "base/version.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"

int st_build_id(const char *path, char out[ST_BUILD_ID_LEN + 1])
{
	const char *p = path ? path : "/proc/self/exe";
	FILE *f = fopen(p, "rb");
	if (!f)
		return st_fail(ST_EIO, "cannot read the binary %s: %s", p, strerror(errno));
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned char buf[1 << 16], md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
	size_t n;
	while (ok && (n = fread(buf, 1, sizeof(buf), f)) > 0)
		ok = EVP_DigestUpdate(ctx, buf, n);
	ok = ok && !ferror(f) && EVP_DigestFinal_ex(ctx, md, &mdlen) && mdlen * 2 >= ST_BUILD_ID_LEN;
	EVP_MD_CTX_free(ctx);
	fclose(f);
	if (!ok)
		return st_fail(ST_EIO, "cannot compute the build id of %s", p);
	for (int i = 0; i < ST_BUILD_ID_LEN / 2; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	return 0;
}
